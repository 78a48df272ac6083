DROP TABLE operator_events;
DROP FUNCTION operator_events_append_only();
DROP TABLE operators;
