"""Spawning a worker's processes on a node, shared by the node agent and the worker side.

``slots``: each worker slot's device, cores and local rank; ``ranks``: the K processes of one
worker, started, failed and stopped together; ``entry``: what a Python command runs, as a warm
interpreter runs it. It imports the standard library only, so both sides import it.
"""
