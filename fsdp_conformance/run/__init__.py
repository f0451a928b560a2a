"""The conformance run: the tiers of cases (``matrix``), one lifecycle for every kind of case
(``lifecycle``, ``kinds``), the run loop (``execute``) and its command (``cli``)."""
