"""Harnesses the tests and the benchmarks share: concurrent writers and readers, updates killed at random moments,
random metadata filters against pandas. The tests run them small; ``benchmarks/`` runs them at full size and
writes the reports. ``gradients`` (GradCache against the plain loss) is the tests' alone."""
