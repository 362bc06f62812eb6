"""Hidden tests of the graded exercises, one module per exercise notebook."""
