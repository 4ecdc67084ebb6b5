"""What the tests share that is not a fixture: runner kits, servers, probes, fault injectors, fakes."""
