"""The initializer steps: fill the workspace from a storage URI, crash-safely.

Flow (``initialize``, shared by the dataset and model steps): ``request`` (what was asked,
from options and environment) -> ``storage_uri`` (parse, pick a source by scheme) ->
``sources`` (one class per scheme; list and fetch files) -> ``filters`` (allow / ignore
patterns, as the hub globs them) and ``weights`` (which weight files a model keeps) ->
``source_change`` (a ``file://`` source still what was staged from it? stat, then hash only
what changed) -> ``kubetune.staging`` (a sibling directory on the same volume), seeded by ``reuse`` (an
earlier result moves only the difference) -> ``downloader`` (parallel, resumable: each file
through ``stream_write`` or ``copy_file``, named safely by ``safe_paths``, checked by
``checksums``, reported by ``progress``) -> ``verify_model`` / ``verify_dataset`` (is the
tree usable?) -> the completion manifest (``kubetune.workspace.initializer_manifest``,
written last, then the staged tree is swapped into place) -> the trainer reads the
verified tree. The tuning a pod spec may set (parallel files, S3 part size and streams,
progress interval) is read in ``settings``.
"""
