"""The worker side: what runs inside a user's job (client, launcher, elastic state,
framework integrations, examples, the torchrun rank agent). It imports :mod:`contract` and the
bottom libraries, never the daemon, the CLI or the node agent's internals."""
