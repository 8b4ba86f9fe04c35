"""Results: verdict files, reports, comparisons, gates and aggregates."""
