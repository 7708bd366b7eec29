"""Collectives and the network fabric per job (pure): features, slow episodes, localisation."""
