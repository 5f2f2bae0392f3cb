"""What several test folders share: the op-test backends (``backends``) and comparisons
(``compare``), the op declarations as tests read them (``op_declarations``), random op states
(``op_states``), tiny engines and configs (``engines``, ``models``), tensor-parallel ranks
(``tp``, with ``tp_child`` the per-rank process), serving processes and their leftovers
(``servers``) and in-process prefill/decode pairs (``pd``). A test module imports helpers from
here, never from another test module."""
