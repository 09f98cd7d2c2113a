"""What runs outside a pod, beside the core: the cluster emulator behind `kubetune local`
(``local``) and the demo's tiny generated models and datasets (``demo``). No step
(initializers, trainer, exporter) and no core module imports this package."""
