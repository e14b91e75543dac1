"""What the daemon side and the worker side agree on, defined once.

The environment a worker is started with (:mod:`contract.workerenv`), the exit codes that say
a stop rather than a failure (:mod:`contract.exits`), the reports workers send and the frames
of the store's channel (:mod:`contract.messages`, :mod:`contract.wire`, :mod:`contract.storekeys`),
how a node is cut into worker slots (:mod:`contract.nodeshape`) and what a torchrun world
holds (:mod:`contract.world`). Standard library only (and :mod:`authframe`): both sides import
it, it imports neither.
"""
