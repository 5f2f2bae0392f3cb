"""The token channel: how worker rank 0 hands each step's tokens to the engine
(``serve --token-channel``): the interface and its errors (:mod:`.base`), the ``shm``
segment (:mod:`.shm`), FastDeploy's SysV messages (:mod:`.sysv`) and a deployment's two ends
(:mod:`.channel`)."""
