"""What a run shows its reader: the HTML report and its plots."""
