"""`kubetune local`'s cluster emulator: read a ClusterTrainingRuntime and a TrainJob
(`runtime_spec`), check them against what our steps need (`runtime_contract`; the
`KUBETUNE_*` values their steps would refuse: `settings_check`; every violation at once:
`violations`; the containers walked: `manifest_walk`), merge them as the controller does
(`runtime_merge`), and run the JobSet
(`jobset`) as processes on this machine (`steps`). Not used inside a pod."""
