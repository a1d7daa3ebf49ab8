"""A run's record and what reads it: run ids and directories (run), the store layout, every key of a
run's prefix (layout) and the typed records behind them (records), stores (store), the code bundle and
node wheel (bundle, wheel), reruns, compare, reports, startup timings and frozen-node diagnosis."""
