"""Every message between the processes of a deployment, typed and versioned: what they share
(:mod:`.wire`: the protocol version, refusals), engine <-> workers (:mod:`.engine_workers`)
and router <-> splitwise instances (:mod:`.router_instances`)."""
