"""`kubetune local`'s cluster emulator: read a ClusterTrainingRuntime and a TrainJob
(`runtime_spec`), merge them as the controller does (`runtime_merge`), and run the JobSet
(`jobset`) as processes on this machine (`steps`). Not used inside a pod."""
