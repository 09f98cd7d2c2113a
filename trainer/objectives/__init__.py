"""What a run optimises: one ``Objective`` per objective, the one door every other room
asks (``objective``: what an objective answers; ``registry``: every objective by name,
the run's resolved once and stored as ``kubetune.objective``). Each objective is a
module:

- ``sft``: supervised fine-tuning, torchtune's fine-tuning recipes (every default);
- ``dpo``: preference tuning; torchtune's DPO recipe and config for a method on a
  topology, the preference builder chosen for the data, the recipes' quirks the
  launcher corrects;
- ``rso``: DPO's recipes with torchtune's hinge loss (``RSOLoss``): one module and one
  registry entry;
- ``distill``: knowledge distillation; torchtune's KD recipe and config for a method on
  a topology, the teacher (named, else the workspace's ``teacher/``) fitted and checked
  against the student's vocabulary, the methods no KD recipe runs refused;
- ``dpo_held_out``: a preference objective's held-out set fitted to the preference builder
  (measured in the recipe process by ``validation.preference_held_out``).

Their data: ``preference_rows`` (preference rows in the shapes users have: TRL's
standard, conversational and implicit-prompt, torchtune's, HH-RLHF's, read as a prompt
and two answers, without torch) and ``preference_data`` (the builder a DPO config's
``dataset`` names: ``_component_:
kubetune.trainer.objectives.preference_data.preference_dataset``).

Imported by ``planning`` (the recipe, the builder, the teacher), by ``metric_logging``
(the parts an objective logs), by the entrypoints (``--objective``, `kubetune size`) and,
by ``_component_`` path, by the recipe process. Below them all: it asks
``performance.memory_plan`` only for the shape of a memory load.
"""
