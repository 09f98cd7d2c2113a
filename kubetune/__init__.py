"""kubetune: the in-pod half of LLM fine-tuning on Kubernetes.

This package's own modules are the core every step shares: the contract between the steps
(environment names in ``env``, the workspace layout and its readers in ``workspace``, typed
errors and exit codes in ``errors``, the termination log in ``termination``) and the
plumbing under them (``storage_uri``, ``remote`` clients, ``retry``, ``staging``,
``credentials``, ``redact``, ``logs``, ``model_family``). The steps live in the
subpackages ``initializers``, ``trainer`` and ``exporter``, driven by the CLI in
``entrypoints``; what runs outside a pod (the `kubetune local` emulator, the demo's tiny
models) is in ``tools``, which neither the core nor a step imports.
"""

__version__ = "0.1.0"
