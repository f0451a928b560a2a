"""Known torch limitations: the entries (``entries``) and how they turn verdicts "known"
(``apply``)."""
