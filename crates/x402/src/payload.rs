//! The JSON payment payload of the paid retry: a signed authorization placed in the x402
//! message of its version. Sits above both `sign` and `wire` (it needs a signature and a
//! requirement), so neither of them depends on the other's output.

use serde_json::Value;

use super::signed::SignedPayment;
use super::wire::{Requirement, WireError, X402Version};

/// The JSON payment payload for `requirement`, ready to be stored in the payments ledger and
/// sent (again, verbatim) with [`encode_payment_header`].
///
/// The message is [`crate::wire::payment_message`]'s; the scheme payload is
/// `{authorization, signature}` (EIP-3009) or `{signature, permit2Authorization}` (Permit2).
///
/// # Errors
/// [`WireError::AuthorizationMismatch`] when `signed` is not an authorization for exactly
/// this requirement (transfer method, network, asset, recipient, amount): a guard that the option signed is the
/// option sent.
pub fn payment_payload(
    version: X402Version,
    requirement: &Requirement,
    resource: Option<&Value>,
    signed: &SignedPayment,
    extensions: Option<&Value>,
) -> Result<Value, WireError> {
    check_matches(requirement, signed)?;
    let coordinates = (requirement.scheme(), requirement.network_raw());
    let raw = requirement.raw();
    Ok(super::wire::payment_message(version, raw, coordinates, resource, signed.payload_json(), extensions))
}

fn check_matches(requirement: &Requirement, signed: &SignedPayment) -> Result<(), WireError> {
    let method = match signed {
        SignedPayment::Eip3009(_) => None,
        SignedPayment::Permit2(p) => Some(p.scheme()),
    };
    if method != super::permit2::scheme_of(requirement) {
        return Err(WireError::AuthorizationMismatch("scheme or assetTransferMethod"));
    }
    if signed.network() != requirement.network() {
        return Err(WireError::AuthorizationMismatch("network"));
    }
    if signed.asset() != requirement.asset() {
        return Err(WireError::AuthorizationMismatch("asset"));
    }
    if signed.pay_to() != requirement.pay_to() {
        return Err(WireError::AuthorizationMismatch("payTo"));
    }
    if signed.amount() != requirement.amount().as_u256() {
        return Err(WireError::AuthorizationMismatch("amount"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use alloy::primitives::B256;
    use serde_json::json;

    use super::*;
    use crate::sign::sign_authorization;
    use crate::wire::tests::{V1_BODY, V2_REQUIRED, signer, v1_402, v2_402, v2_entry, v2_with_entries};
    use crate::wire::{decode_payment_header, encode_payment_header, payment_extensions};

    #[test]
    fn builds_a_v2_payment_header_like_the_official_client() {
        let pr = v2_402(V2_REQUIRED).unwrap();
        let req = &pr.accepts[0];
        let nonce = B256::repeat_byte(0x11);
        let signed = sign_authorization(&signer(), req, nonce, 1_796_203_347, 3600).unwrap();
        let payload =
            payment_payload(pr.version, req, pr.resource.as_ref(), &SignedPayment::from(signed.clone()), None).unwrap();
        let (name, value) = encode_payment_header(pr.version, &payload).unwrap();
        assert_eq!(name, "payment-signature");
        // Standard padded base64 of JSON.
        let text = value.to_str().unwrap();
        assert_eq!(text.len() % 4, 0);
        assert!(!text.contains('-') && !text.contains('_'));

        let sent = decode_payment_header(&value).unwrap();
        assert_eq!(sent, payload);
        let original: Value = serde_json::from_str(V2_REQUIRED).unwrap();
        assert_eq!(sent["x402Version"], 2);
        assert_eq!(sent["accepted"], original["accepts"][0]);
        assert_eq!(sent["resource"], original["resource"]);
        assert!(sent.get("extensions").is_none());
        let auth = &sent["payload"]["authorization"];
        assert_eq!(auth["from"], "0x70997970C51812dc3A010C7d01b50e0d17dc79C8");
        assert_eq!(auth["to"], "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC");
        assert_eq!(auth["value"], "10000");
        assert_eq!(auth["validAfter"], "1796202747");
        assert_eq!(auth["validBefore"], "1796203647");
        assert_eq!(auth["nonce"], format!("0x{}", "11".repeat(32)));
        let sig = sent["payload"]["signature"].as_str().unwrap();
        assert_eq!(sig.len(), 132);
        assert!(sig.ends_with("1b") || sig.ends_with("1c"));
        let keys: Vec<_> = sent.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["accepted", "payload", "resource", "x402Version"]);
    }

    #[test]
    fn builds_a_v1_payment_header_echoing_the_original_network_name() {
        let body = V1_BODY.replace("\"base-sepolia\"", "\"Base-Sepolia\"");
        let pr = v1_402(&body).unwrap();
        let req = &pr.accepts[0];
        let signed = sign_authorization(&signer(), req, B256::ZERO, 1_796_202_752 + 600, 3600).unwrap();
        let payload =
            payment_payload(pr.version, req, None, &SignedPayment::from(signed.clone()), Some(&json!({"x": {}})))
                .unwrap();
        let (name, value) = encode_payment_header(pr.version, &payload).unwrap();
        assert_eq!(name, "x-payment");
        let sent = decode_payment_header(&value).unwrap();
        assert_eq!(sent["x402Version"], 1);
        assert_eq!(sent["scheme"], "exact");
        assert_eq!(sent["network"], "Base-Sepolia");
        assert_eq!(sent["payload"]["authorization"]["value"], "10000");
        assert_eq!(sent["payload"]["authorization"]["validAfter"], "1796202752");
        assert_eq!(sent["payload"]["authorization"]["validBefore"], "1796203412");
        let mut keys: Vec<_> = sent.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        assert_eq!(keys, ["network", "payload", "scheme", "x402Version"]);
    }

    #[test]
    fn refuses_to_send_an_authorization_for_another_option() {
        let pr = v2_with_entries(json!([v2_entry("10"), v2_entry("20")])).unwrap();
        let signed = sign_authorization(&signer(), &pr.accepts[0], B256::ZERO, 1_800_000_000, 3600).unwrap();
        let err =
            payment_payload(pr.version, &pr.accepts[1], None, &SignedPayment::from(signed.clone()), None).unwrap_err();
        assert!(matches!(err, WireError::AuthorizationMismatch("amount")));
    }

    #[test]
    fn payment_identifier_is_added_to_the_echoed_extensions() {
        let declared = json!({
            "payment-identifier": {
                "info": {"required": true},
                "schema": {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                           "properties": {"id": {"type": "string", "minLength": 16, "maxLength": 128}}}
            },
            "bazaar": {"info": {"x": 1}, "schema": {}}
        });
        let message = json!({"x402Version": 2, "accepts": [v2_entry("1")], "extensions": declared});
        let pr = v2_402(&message.to_string()).unwrap();
        assert!(pr.advertises_payment_identifier());
        assert!(pr.requires_payment_identifier());

        let id = "pay_0123456789abcdef0123456789abcdef";
        let ext = payment_extensions(pr.extensions.as_ref(), id).unwrap().unwrap();
        assert_eq!(ext["payment-identifier"]["info"]["id"], id);
        assert_eq!(ext["payment-identifier"]["info"]["required"], true);
        assert_eq!(ext["payment-identifier"]["schema"], declared["payment-identifier"]["schema"]);
        assert_eq!(ext["bazaar"], declared["bazaar"]);

        let signed = sign_authorization(&signer(), &pr.accepts[0], B256::ZERO, 1_800_000_000, 3600).unwrap();
        let payload =
            payment_payload(pr.version, &pr.accepts[0], None, &SignedPayment::from(signed.clone()), Some(&ext))
                .unwrap();
        assert_eq!(payload["extensions"]["payment-identifier"]["info"]["id"], id);

        assert!(matches!(payment_extensions(pr.extensions.as_ref(), "short"), Err(WireError::InvalidPaymentId)));
        assert!(payment_extensions(pr.extensions.as_ref(), &"a".repeat(129)).is_err());
        assert!(payment_extensions(pr.extensions.as_ref(), "pay_0123456789abcdef!").is_err());
    }
}
