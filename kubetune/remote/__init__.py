"""Clients for the remote services every step talks to (S3, the Hugging Face Hub, the
TrainJob status API of Kubeflow Trainer): one setup (credentials, endpoint, single attempts
under `kubetune.retry`; endpoint / region / role / timeout read from the environment in
`settings`, their values checked in `endpoint_values`) and one reading of their failures
(retry, or one line naming what to fix)."""
