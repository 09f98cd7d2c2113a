"""What the run asks for, before any file is read: the `tune run` command Kubeflow Trainer
composes (``tune_command``), the nodes and processes it runs on (``topology``: torchrun
options, else ``PET_*``), the torchtune recipe for method x topology (``methods``),
`kubetune train`'s options as the same request (``train_options``; ``spelling``: the
variable or option that set a config key, for hints in the user's syntax), and what the
launcher reads from its environment (``settings``: ``PET_*``)."""
