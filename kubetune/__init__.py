"""kubetune: the in-pod half of LLM fine-tuning on Kubernetes.

The shared contract every step reads lives here: environment names (`env`), the
workspace layout (`workspace`), typed errors and exit codes (`errors`) and the
termination log (`termination`). The steps themselves live in the top-level packages
`initializers`, `trainer`, `exporter`, driven by the CLI in `entrypoints`.
"""

__version__ = "0.1.0"
