"""What a splitwise (disaggregated prefill/decode) ``serve`` instance adds: the
``/v1/splitwise/*`` endpoints (:mod:`.endpoints`), the engine loop that hands requests over
or takes them in (:mod:`.engine`), and its start-up (:mod:`.instance`). The KV transfer
itself is :mod:`fastdeploy_mtp.splitwise`'s."""
