"""Clients for the remote services every step talks to (S3, the Hugging Face Hub, the
TrainJob status API of Kubeflow Trainer): one setup (credentials, endpoint, single attempts
under `kubetune.retry`; tokens and keys from the environment or a mounted Secret in
`credentials`, registered for redaction; endpoint / region / role / timeout read from the
environment in `settings`, their values checked in `endpoint_values`) and one reading of
their failures (`s3_errors`, `hub_errors`, a host name that does not exist in
`unknown_host`: retry, or one line naming what to fix). `trainjob_status` sends progress
into the TrainJob's status."""
