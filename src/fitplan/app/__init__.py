"""The application layer shared by the command line (``cli/``) and the server (``web/``): the scenario
options and the steps from options to an estimate, a recommendation or an explanation."""
