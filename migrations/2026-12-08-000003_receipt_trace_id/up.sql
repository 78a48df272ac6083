-- The OpenTelemetry trace id of the call a receipt records (issue 26), when the router
-- exported traces (OTEL_EXPORTER_OTLP_ENDPOINT); NULL otherwise, and for older receipts.
-- Part of the signed receipt when present.
ALTER TABLE receipts ADD COLUMN trace_id TEXT;
