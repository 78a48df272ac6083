// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

/// @title Permit2 — the signature-transfer half of Uniswap's Permit2, for local x402 tests.
/// @notice Placed at Permit2's canonical address (0x000000000022D473030F116dDEE9F6B43aC78BA3) on a
///         test chain with `anvil_setCode`, so Permit2 payments signed for the real contract settle
///         here unchanged: same EIP-712 domain ({name: "Permit2", chainId, verifyingContract}, no
///         version), same type strings, same unordered-nonce bitmap.
/// @dev Written for this project. Deliberately minimal: `permitWitnessTransferFrom` (one token),
///      `nonceBitmap`, `invalidateUnorderedNonces`, `DOMAIN_SEPARATOR`; EOA signatures only. It has
///      no constructor state (the domain separator is computed per call) because `anvil_setCode`
///      runs no constructor.
contract Permit2 {
    struct TokenPermissions {
        address token;
        uint256 amount;
    }

    struct PermitTransferFrom {
        TokenPermissions permitted;
        uint256 nonce;
        uint256 deadline;
    }

    struct SignatureTransferDetails {
        address to;
        uint256 requestedAmount;
    }

    bytes32 public constant TOKEN_PERMISSIONS_TYPEHASH = keccak256("TokenPermissions(address token,uint256 amount)");
    /// @notice Prefix of the witness type string (Permit2's `PERMIT_TRANSFER_FROM_WITNESS_TYPEHASH_STUB`).
    string public constant PERMIT_TRANSFER_FROM_WITNESS_TYPEHASH_STUB =
        "PermitWitnessTransferFrom(TokenPermissions permitted,address spender,uint256 nonce,uint256 deadline,";

    bytes32 private constant DOMAIN_TYPEHASH = keccak256("EIP712Domain(string name,uint256 chainId,address verifyingContract)");
    bytes32 private constant NAME_HASH = keccak256("Permit2");
    /// @dev Upper bound for `s` (secp256k1 order / 2): higher values are malleable copies.
    uint256 private constant HALF_CURVE_ORDER = 0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0;

    /// @notice owner => word position => bitmap of used (or invalidated) nonces.
    mapping(address => mapping(uint256 => uint256)) public nonceBitmap;

    event UnorderedNonceInvalidation(address indexed owner, uint256 word, uint256 mask);

    error SignatureExpired(uint256 signatureDeadline);
    error InvalidAmount(uint256 maxAmount);
    error InvalidNonce();
    error InvalidSignatureLength();
    error InvalidSignature();
    error InvalidSigner();
    error TransferFailed();

    function DOMAIN_SEPARATOR() public view returns (bytes32) {
        return keccak256(abi.encode(DOMAIN_TYPEHASH, NAME_HASH, block.chainid, address(this)));
    }

    /// @notice Moves `transferDetails.requestedAmount` (≤ `permit.permitted.amount`) of the token
    ///         from `owner` to `transferDetails.to`, if `owner` signed `permit` for `msg.sender` as
    ///         spender together with `witness` (typed by `witnessTypeString`). Uses the nonce.
    function permitWitnessTransferFrom(
        PermitTransferFrom memory permit,
        SignatureTransferDetails calldata transferDetails,
        address owner,
        bytes32 witness,
        string calldata witnessTypeString,
        bytes calldata signature
    ) external {
        if (block.timestamp > permit.deadline) revert SignatureExpired(permit.deadline);
        if (transferDetails.requestedAmount > permit.permitted.amount) revert InvalidAmount(permit.permitted.amount);
        useUnorderedNonce(owner, permit.nonce);

        bytes32 typeHash = keccak256(abi.encodePacked(PERMIT_TRANSFER_FROM_WITNESS_TYPEHASH_STUB, witnessTypeString));
        bytes32 permissionsHash = keccak256(abi.encode(TOKEN_PERMISSIONS_TYPEHASH, permit.permitted));
        bytes32 structHash =
            keccak256(abi.encode(typeHash, permissionsHash, msg.sender, permit.nonce, permit.deadline, witness));
        bytes32 digest = keccak256(abi.encodePacked("\x19\x01", DOMAIN_SEPARATOR(), structHash));
        requireSigner(owner, digest, signature);

        moveTokens(permit.permitted.token, owner, transferDetails.to, transferDetails.requestedAmount);
    }

    /// @notice Marks the nonces of `mask` in word `wordPos` of the caller as used.
    function invalidateUnorderedNonces(uint256 wordPos, uint256 mask) external {
        nonceBitmap[msg.sender][wordPos] |= mask;
        emit UnorderedNonceInvalidation(msg.sender, wordPos, mask);
    }

    function useUnorderedNonce(address from, uint256 nonce) private {
        uint256 wordPos = nonce >> 8;
        uint256 bit = uint256(1) << (nonce & 0xff);
        uint256 flipped = nonceBitmap[from][wordPos] ^= bit;
        if (flipped & bit == 0) revert InvalidNonce();
    }

    function requireSigner(address owner, bytes32 digest, bytes calldata signature) private pure {
        if (signature.length != 65) revert InvalidSignatureLength();
        bytes32 r = bytes32(signature[0:32]);
        bytes32 s = bytes32(signature[32:64]);
        uint8 v = uint8(signature[64]);
        if (uint256(s) > HALF_CURVE_ORDER || (v != 27 && v != 28)) revert InvalidSignature();
        address signer = ecrecover(digest, v, r, s);
        if (signer == address(0)) revert InvalidSignature();
        if (signer != owner) revert InvalidSigner();
    }

    function moveTokens(address token, address from, address to, uint256 amount) private {
        (bool ok, bytes memory data) = token.call(abi.encodeWithSelector(0x23b872dd, from, to, amount));
        if (!ok || (data.length != 0 && !abi.decode(data, (bool))) || token.code.length == 0) {
            revert TransferFailed();
        }
    }
}
