"""``python -m rollgym``: the ``rollgym`` command, for an interpreter without its script."""

from rollgym.import_path import drop_working_directory

# ``-m`` put the working directory first on sys.path, where the ``rollgym`` script puts its own
# folder, and an empty or relative PYTHONPATH element puts it (or a folder under it) further
# on: a file there named like a module the run imports (an ``impl:``'s, a verifier's
# dependency) would replace it in this process (the pre-flight, agents in process). Taken off
# before anything else is imported, as the server processes never have it (``python -P``).
drop_working_directory(module_run=True)

from rollgym.cli.main import main  # noqa: E402

main()
