"""What the run asks for, before any file is read: the `tune run` command Kubeflow Trainer
composes (``tune_command``), the nodes and processes it runs on (``topology``: torchrun
options, else ``PET_*``), the torchtune recipe for method x topology (``methods``),
`kubetune train`'s options as the same request (``train_options``; ``spelling``: the
variable or option that set a config key, for hints in the user's syntax; ``process_hint``:
how the user asks for more processes on their path; ``value_rules``:
the range of each number a setting or key may hold, read by the trainer's checks and by
the static check of a runtime's settings), and what the
launcher reads from its environment (``settings``: ``PET_*``), and what torchrun and the
launcher tell a recipe process through its environment (``passed_env``: rank, stop file,
compile backend, test hooks; read there alone). The lowest room: it imports no other."""
