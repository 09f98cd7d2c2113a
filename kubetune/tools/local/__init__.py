"""`kubetune local`'s cluster emulator: read a ClusterTrainingRuntime and a TrainJob
(`runtime_spec`), check them against what our steps need (`runtime_contract`), merge them as the controller does (`runtime_merge`), and run the JobSet
(`jobset`) as processes on this machine (`steps`). Not used inside a pod."""
