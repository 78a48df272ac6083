//! Diesel table definitions, matching `migrations/` (written by hand; see diesel.toml).
//! Amount columns (NUMERIC) are not declared here: they are read and written with SQL
//! that casts them to text, so no big-decimal type is needed.

diesel::table! {
    agents (id) {
        id -> Uuid,
        name -> Text,
        api_key_hash -> Text,
        disabled -> Bool,
        created_at -> Timestamptz,
    }
}

diesel::table! {
    receipts (agent_id, id) {
        id -> Uuid,
        agent_id -> Uuid,
        idempotency_key -> Text,
        request_hash -> Text,
        method -> Text,
        url -> Text,
        upstream_status -> Nullable<Int4>,
        upstream_body_sha256 -> Text,
        payment -> Nullable<Jsonb>,
        outcome -> Text,
        created_at -> Timestamptz,
        signer -> Text,
        signature -> Text,
        trace_id -> Nullable<Text>,
    }
}

diesel::table! {
    idempotency_keys (agent_id, key) {
        agent_id -> Uuid,
        key -> Text,
        request_hash -> Text,
        status -> Text,
        lease -> Uuid,
        response_status_code -> Nullable<Int4>,
        response_body -> Nullable<Bytea>,
        receipt_id -> Nullable<Uuid>,
        created_at -> Timestamptz,
        first_seen_at -> Timestamptz,
        completed_at -> Nullable<Timestamptz>,
        takeovers -> Int4,
        expires_at -> Timestamptz,
    }
}

diesel::joinable!(idempotency_keys -> agents (agent_id));
diesel::joinable!(receipts -> agents (agent_id));

// `payments.signed_at` (when the current authorization was signed) is not listed (only raw SQL
// reads or writes it: `payments::IN_WINDOW_24H`, `payments::store`), nor are the clear columns
// that rows written before secrets were sealed still hold until `secrets::sweep` seals them
// (`header_value`, `requirement_json`, `context_json`, `request_headers`, `request_body`:
// raw SQL in `payments::kept` only), nor `budget_num`/`budget_den` (raw SQL in `payments::usage`
// and `payments::store` only). diesel's limit is 32 columns.
diesel::table! {
    payments (agent_id, id) {
        id -> Uuid,
        agent_id -> Uuid,
        idempotency_key -> Text,
        request_hash -> Text,
        x402_version -> Int2,
        scheme -> Text,
        network -> Text,
        asset -> Text,
        pay_to -> Text,
        payer -> Text,
        nonce -> Text,
        valid_after -> Int8,
        valid_before -> Int8,
        requirement -> Jsonb,
        context -> Jsonb,
        signed_authorization -> Jsonb,
        header_name -> Text,
        status -> Text,
        tx_hash -> Nullable<Text>,
        error -> Nullable<Text>,
        attempts -> Int4,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
        request_method -> Nullable<Text>,
        request_url -> Nullable<Text>,
        advertised_extensions -> Nullable<Bytea>,
        recovery -> Nullable<Jsonb>,
        sealed -> Nullable<Bytea>,
        sealed_key_id -> Nullable<Text>,
    }
}

diesel::joinable!(payments -> agents (agent_id));

diesel::table! {
    recovered_answers (agent_id, payment_id) {
        agent_id -> Uuid,
        payment_id -> Uuid,
        kind -> Text,
        receipt_id -> Uuid,
        http_status -> Int4,
        body -> Bytea,
        created_at -> Timestamptz,
    }
}

diesel::allow_tables_to_appear_in_same_query!(payments, agents, receipts, idempotency_keys, recovered_answers);

diesel::table! {
    batch_lanes (id) {
        id -> Uuid,
        wallet -> Text,
        pay_to -> Text,
        network -> Text,
        asset -> Text,
        receiver_authorizer -> Text,
        withdraw_delay -> Int8,
        salt -> Text,
        channel_id -> Text,
        signed_ceiling -> Numeric,
        voucher -> Nullable<Jsonb>,
        charged -> Numeric,
        deposited -> Numeric,
        deposit -> Nullable<Jsonb>,
        in_flight -> Nullable<Uuid>,
        in_flight_at -> Nullable<Timestamptz>,
        stopped -> Nullable<Text>,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
        state -> Text,
        claimed -> Nullable<Numeric>,
        balance -> Nullable<Numeric>,
        refunded -> Numeric,
        url -> Nullable<Text>,
        withdraw_after -> Nullable<Int8>,
    }
}
