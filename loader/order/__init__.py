"""The order: an epoch's rows shuffled and cut into global steps, computed a window at a time.

`EpochOrder` (permutation.py) gives an epoch's row order without an array of every row;
`steps.py` cuts it, from any start position, into rank batches of `rows_per_batch` rows or
`tokens_per_batch` tokens, split over data-parallel ranks so each rank gets the same number of
steps and every row is used exactly once; `balance.py` evens attention cost over the ranks of
a step; `nodes.py` deals the order's windows to nodes (`nodes=N`), so each node's ranks read
their own share; `ahead.py` starts the steps a dataset decodes ahead.

Records in: row counts (`loader.store.RowIndex`), the seed, the epoch. Out: steps of row ids.
May import: loader's top-level modules, `store`; packtool's `dataset`, `errors`.

Modules:
- `permutation.py`: an epoch's row order, by windows.
- `steps.py`: global steps and their split over ranks.
- `balance.py`: rank balance within a step.
- `nodes.py`: the order dealt to nodes.
- `ahead.py`: the steps started ahead of their turn (`look_ahead`, shared by the datasets).
"""
