"""Fast by default: the device and dtype of this machine (``hardware``), sizes and FLOPs of
the model by method (``model_shape``), the micro-batch and activation checkpointing that fit
a GPU (``memory_plan``), whether the container's memory holds the checkpoint each process
loads (``host_memory``), and the speed defaults applied where the user said nothing
(``speed``: packing, compile, the memory plan), and the CPU cores a pod may use
(``cpu_cores``: its cpuset and CPU limit). Before a run: the nodes, GPUs and memory it
needs, from that same plan (``sizing``), for a model read from its config.json
(``sized_model``; `kubetune size`)."""
