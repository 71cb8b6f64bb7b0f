"""What the tests share: waits and counts (helpers), the processes a test starts and
ends (processes, launcher, launched), the user tables (models), the dashboard's client
(dashboard_kit)."""
