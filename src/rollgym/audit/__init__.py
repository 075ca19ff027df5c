"""``rollgym audit``: the rewards a policy can take without solving the task (issue 39).

    panel (probes from a row) -> target (played through the server's own protocol)
        -> verdict (against a plainly wrong answer's floor and the row's reference)

``play.audit_server`` audits one running server; ``run.audit_config`` every resources server of
a config, started as ``rollgym check`` starts them.
"""
