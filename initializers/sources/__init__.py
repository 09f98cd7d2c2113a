"""Storage sources, one class per URI scheme (registered as ``kubetune.storage`` entry points)."""
