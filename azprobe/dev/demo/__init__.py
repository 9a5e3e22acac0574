"""`azprobe lab demo`: the whole loop (lab, agent, devconsul, controller) driven through
a scripted fault scenario, with a live view and figures measured from Consul KV."""

DEMO_LAB_NAME = "azdemo"  # the demo's lab; `lab demo --name` picks another
