"""What the trainer and the exporter both know about a model family: the torchtune
builder and checkpointer for a Hugging Face ``config.json`` (``architecture``), the
HF -> torchtune weight conversion and the key tables where ours depart from torchtune's
(``convert``), and the scoped change of a torchtune table (``scoped``). Below both steps:
it imports neither. Our builders and checkpointers stay in ``kubetune.trainer.models``,
where configs name them by ``_component_``."""
