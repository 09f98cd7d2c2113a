"""The initializer steps: fill the workspace from a storage URI, crash-safely.

Flow: ``storage_uri`` (parse, pick a source by scheme) -> ``sources`` (list and fetch
files) -> ``kubetune.staging`` (a sibling directory on the same volume) -> ``verify_model`` /
``verify_dataset`` (is the tree usable?) -> ``manifest`` (written last, then the staged
tree is swapped into place) -> the trainer reads the verified tree. The tuning a pod spec
may set (parallel files, S3 part size and streams, progress interval) is read in
``settings``.
"""
