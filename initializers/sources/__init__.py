"""Storage sources, one class per URI scheme (registered as ``kubetune.storage`` entry points):
``local`` (file:// and mounted paths), ``hf`` (the Hugging Face Hub), ``s3`` (with
``s3_part_state``, the ranged parts already whole on disk), all implementing ``base``."""
