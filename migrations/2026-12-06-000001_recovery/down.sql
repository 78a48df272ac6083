ALTER TABLE payments
    DROP COLUMN recovery,
    DROP COLUMN advertised_extensions,
    DROP COLUMN request_body,
    DROP COLUMN request_headers,
    DROP COLUMN request_url,
    DROP COLUMN request_method;
