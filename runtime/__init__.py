"""The serving runtime: host-side bookkeeping (numpy only) around one jitted, donated model step."""
