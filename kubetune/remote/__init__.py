"""Clients for the remote services every step talks to: ``s3`` (S3 and compatible stores)
and ``hub`` (the Hugging Face Hub), each set up once (credentials, endpoint, single
attempts under `kubetune.retry`), and ``trainjob_status`` (progress into the TrainJob's
status, as the kubeflow SDK speaks it). Tokens and keys come from the environment or a
mounted Secret in ``credentials``, registered for redaction; endpoint / region / role /
timeout are read from the environment in ``settings``, their values checked in
``endpoint_values``. One reading of their failures: ``s3_errors``, ``hub_errors`` (retry,
or one line naming what to fix), ``unknown_host`` (a host name that does not exist is the
user's to fix)."""
