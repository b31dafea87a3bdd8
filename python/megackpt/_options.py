"""The engine's writer options, built from Python keywords in one place: the native
API (``megackpt.save`` / ``async_save``) and the DCP storage writers
(``megackpt.torch`` / ``megackpt.tensorplay``) both pass this dict to ``_core``."""


def writer_options(thread_count, sync, overwrite, direct_io=False, **mega):
    """``{"thread_count", "sync", "overwrite", "direct_io"}`` plus every MEGA option
    in ``mega`` that is not None (``fqn_to_index_mapping``, ``checksum``,
    ``consolidate``, ``files_per_rank``); None leaves the engine's default."""
    options = {"thread_count": int(thread_count), "sync": bool(sync),
               "overwrite": bool(overwrite), "direct_io": bool(direct_io)}
    for key, value in mega.items():
        if value is None:
            continue
        options[key] = dict(value) if key == "fqn_to_index_mapping" else value
    return options
