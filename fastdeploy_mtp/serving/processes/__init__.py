"""``fastdeploy-mtp serve``'s processes on one machine: its options (:mod:`.serve_options`)
and what they plan (:mod:`.planning`), start-up (:mod:`.server`, :mod:`.start_up`), the
settings every process derives its config from (:mod:`.layout`), the cache manager
(:mod:`.cache_manager`), the workers (:mod:`.worker_process`) and the engine's side of them
(:mod:`.worker_group`, :mod:`.remote_runner`), how children stop (:mod:`.child_process`) and
a deployment's private runtime directory (:mod:`.runtime_dir`)."""
