"""The ``renyi-stream`` command line: one subcommand per job or question, parsing and error
wording only; the work is done by the jobs it calls."""
