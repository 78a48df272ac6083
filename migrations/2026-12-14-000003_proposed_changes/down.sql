DROP TABLE proposed_changes;
