"""A method built only from the four pieces docs/architecture.md names, plus its registry entry: the
house's promise, which `tests/test_new_method.py` runs (in-process and in Ray, under DP and SecAgg+).

Listed in `FEDAPP_METHODS` (`tests.skeleton.method`) it is registered in every process of a run; the tests
do that in a fixture, so no user ever sees it."""
