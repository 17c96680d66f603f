"""The fleetopt pipeline and user surface, by stage.

``io`` (file -> validated instance) -> ``plan`` (candidates -> MIP -> plans)
-> ``simulation`` (simulate, verify, trim) -> ``report`` (JSON contract and
tables) -> ``api`` (what a notebook calls) -> ``cli`` (click commands over the
api). ``errors`` sits below every stage; ``bench`` beside the api. Imports run
downward only (``tests/test_layering.py``).
"""
