"""The VM agent: what a job's or pool's VM runs (stdlib only, Python >= 3.8).

Shipped as a zipapp (infra/agent_artifact.py) that a small bootstrap fetches from the stack's bucket
and verifies by digest. ``agent.schema`` is also imported by ``cli/`` and ``infra/``: the event
schema, object names and limits live there once.
"""
