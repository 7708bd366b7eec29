"""Sources of GPU readings, one interface (see ``base.Source``), chosen by config."""
