// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

/// @title TestToken — a USDC look-alike for local x402 tests.
/// @notice ERC-20 with 6 decimals, the EIP-712 domain of Circle's USDC ("USD Coin", version "2")
///         and EIP-3009 authorizations (transfer, receive, cancel), so payments signed for real
///         USDC settle here unchanged. `mint` is open to anyone: this contract is for test chains only.
/// @dev Written for this project. The EIP-3009 type hashes are those of the standard, so a
///      signature made for USDC over the same domain fields is valid here too.
contract TestToken {
    // ---------------------------------------------------------------- ERC-20 state

    string public constant name = "USD Coin";
    string public constant symbol = "USDC";

    /// @notice 6, as USDC's (`TestToken18` overrides it: a second stablecoin of 18 decimals).
    function decimals() public pure virtual returns (uint8) {
        return 6;
    }
    /// @notice EIP-712 domain version, exposed like USDC's `version()`.
    string public constant version = "2";

    uint256 public totalSupply;
    mapping(address => uint256) public balanceOf;
    mapping(address => mapping(address => uint256)) public allowance;

    event Transfer(address indexed from, address indexed to, uint256 value);
    event Approval(address indexed owner, address indexed spender, uint256 value);

    // ---------------------------------------------------------------- EIP-712 / EIP-3009 state

    bytes32 private constant DOMAIN_TYPEHASH =
        keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)");

    bytes32 public constant TRANSFER_WITH_AUTHORIZATION_TYPEHASH = keccak256(
        "TransferWithAuthorization(address from,address to,uint256 value,uint256 validAfter,uint256 validBefore,bytes32 nonce)"
    );
    bytes32 public constant RECEIVE_WITH_AUTHORIZATION_TYPEHASH = keccak256(
        "ReceiveWithAuthorization(address from,address to,uint256 value,uint256 validAfter,uint256 validBefore,bytes32 nonce)"
    );
    bytes32 public constant CANCEL_AUTHORIZATION_TYPEHASH =
        keccak256("CancelAuthorization(address authorizer,bytes32 nonce)");

    /// @dev ERC-1271 magic value returned by `isValidSignature(bytes32,bytes)`.
    bytes4 private constant ERC1271_MAGIC_VALUE = 0x1626ba7e;
    /// @dev Upper bound for `s` (secp256k1 order / 2): higher values are malleable copies.
    uint256 private constant HALF_CURVE_ORDER = 0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0;

    uint256 private immutable cachedChainId;
    bytes32 private immutable cachedDomainSeparator;

    /// @dev authorizer => nonce => used or canceled.
    mapping(address => mapping(bytes32 => bool)) private usedAuthorizations;

    event AuthorizationUsed(address indexed authorizer, bytes32 indexed nonce);
    event AuthorizationCanceled(address indexed authorizer, bytes32 indexed nonce);

    constructor() {
        cachedChainId = block.chainid;
        cachedDomainSeparator = buildDomainSeparator();
    }

    // ---------------------------------------------------------------- ERC-20

    function transfer(address to, uint256 value) external returns (bool) {
        moveTokens(msg.sender, to, value);
        return true;
    }

    function approve(address spender, uint256 value) external returns (bool) {
        allowance[msg.sender][spender] = value;
        emit Approval(msg.sender, spender, value);
        return true;
    }

    function transferFrom(address from, address to, uint256 value) external returns (bool) {
        uint256 allowed = allowance[from][msg.sender];
        if (allowed != type(uint256).max) {
            require(allowed >= value, "TestToken: transfer amount exceeds allowance");
            unchecked {
                allowance[from][msg.sender] = allowed - value;
            }
        }
        moveTokens(from, to, value);
        return true;
    }

    /// @notice Open mint for tests: anyone may create tokens for anyone.
    function mint(address to, uint256 value) external returns (bool) {
        require(to != address(0), "TestToken: mint to the zero address");
        totalSupply += value;
        unchecked {
            balanceOf[to] += value; // cannot overflow: bounded by totalSupply
        }
        emit Transfer(address(0), to, value);
        return true;
    }

    // ---------------------------------------------------------------- EIP-712 / EIP-5267

    function DOMAIN_SEPARATOR() public view returns (bytes32) {
        return block.chainid == cachedChainId ? cachedDomainSeparator : buildDomainSeparator();
    }

    /// @notice EIP-5267 description of the EIP-712 domain: name, version, chainId, verifyingContract.
    function eip712Domain()
        external
        view
        returns (
            bytes1 fields,
            string memory domainName,
            string memory domainVersion,
            uint256 chainId,
            address verifyingContract,
            bytes32 salt,
            uint256[] memory extensions
        )
    {
        return (hex"0f", name, version, block.chainid, address(this), bytes32(0), new uint256[](0));
    }

    // ---------------------------------------------------------------- EIP-3009

    /// @notice Whether `nonce` of `authorizer` was used or canceled.
    function authorizationState(address authorizer, bytes32 nonce) external view returns (bool) {
        return usedAuthorizations[authorizer][nonce];
    }

    function transferWithAuthorization(
        address from,
        address to,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce,
        uint8 v,
        bytes32 r,
        bytes32 s
    ) external {
        transferWithAuthorization(from, to, value, validAfter, validBefore, nonce, abi.encodePacked(r, s, v));
    }

    /// @notice Same as the (v, r, s) form; `signature` is 65 bytes r‖s‖v for an EOA, or anything an
    ///         ERC-1271 wallet at `from` accepts.
    function transferWithAuthorization(
        address from,
        address to,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce,
        bytes memory signature
    ) public {
        checkWindow(from, nonce, validAfter, validBefore);
        bytes32 structHash =
            keccak256(abi.encode(TRANSFER_WITH_AUTHORIZATION_TYPEHASH, from, to, value, validAfter, validBefore, nonce));
        requireValidSignature(from, structHash, signature);
        markUsed(from, nonce);
        moveTokens(from, to, value);
    }

    function receiveWithAuthorization(
        address from,
        address to,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce,
        uint8 v,
        bytes32 r,
        bytes32 s
    ) external {
        receiveWithAuthorization(from, to, value, validAfter, validBefore, nonce, abi.encodePacked(r, s, v));
    }

    /// @notice Like `transferWithAuthorization`, but only the payee may submit it (front-running safe).
    function receiveWithAuthorization(
        address from,
        address to,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce,
        bytes memory signature
    ) public {
        require(to == msg.sender, "TestToken: caller must be the payee");
        checkWindow(from, nonce, validAfter, validBefore);
        bytes32 structHash =
            keccak256(abi.encode(RECEIVE_WITH_AUTHORIZATION_TYPEHASH, from, to, value, validAfter, validBefore, nonce));
        requireValidSignature(from, structHash, signature);
        markUsed(from, nonce);
        moveTokens(from, to, value);
    }

    function cancelAuthorization(address authorizer, bytes32 nonce, uint8 v, bytes32 r, bytes32 s) external {
        cancelAuthorization(authorizer, nonce, abi.encodePacked(r, s, v));
    }

    /// @notice Burns an unused nonce so that the authorization carrying it can never be used.
    function cancelAuthorization(address authorizer, bytes32 nonce, bytes memory signature) public {
        require(!usedAuthorizations[authorizer][nonce], "TestToken: authorization is used or canceled");
        bytes32 structHash = keccak256(abi.encode(CANCEL_AUTHORIZATION_TYPEHASH, authorizer, nonce));
        requireValidSignature(authorizer, structHash, signature);
        usedAuthorizations[authorizer][nonce] = true;
        emit AuthorizationCanceled(authorizer, nonce);
    }

    // ---------------------------------------------------------------- internals

    function buildDomainSeparator() private view returns (bytes32) {
        return keccak256(
            abi.encode(DOMAIN_TYPEHASH, keccak256(bytes(name)), keccak256(bytes(version)), block.chainid, address(this))
        );
    }

    function moveTokens(address from, address to, uint256 value) private {
        require(from != address(0), "TestToken: transfer from the zero address");
        require(to != address(0), "TestToken: transfer to the zero address");
        uint256 held = balanceOf[from];
        require(held >= value, "TestToken: transfer amount exceeds balance");
        unchecked {
            balanceOf[from] = held - value;
            balanceOf[to] += value; // cannot overflow: bounded by totalSupply
        }
        emit Transfer(from, to, value);
    }

    function checkWindow(address authorizer, bytes32 nonce, uint256 validAfter, uint256 validBefore) private view {
        require(block.timestamp > validAfter, "TestToken: authorization is not yet valid");
        require(block.timestamp < validBefore, "TestToken: authorization is expired");
        require(!usedAuthorizations[authorizer][nonce], "TestToken: authorization is used or canceled");
    }

    function markUsed(address authorizer, bytes32 nonce) private {
        usedAuthorizations[authorizer][nonce] = true;
        emit AuthorizationUsed(authorizer, nonce);
    }

    /// @dev EOAs sign with ECDSA over the EIP-712 digest; contracts answer ERC-1271.
    function requireValidSignature(address signer, bytes32 structHash, bytes memory signature) private view {
        bytes32 digest = keccak256(abi.encodePacked(hex"1901", DOMAIN_SEPARATOR(), structHash));
        if (signer.code.length > 0) {
            (bool ok, bytes memory answer) =
                signer.staticcall(abi.encodeWithSelector(ERC1271_MAGIC_VALUE, digest, signature));
            require(
                ok && answer.length >= 32 && abi.decode(answer, (bytes4)) == ERC1271_MAGIC_VALUE,
                "TestToken: invalid signature"
            );
            return;
        }
        require(signature.length == 65, "TestToken: invalid signature length");
        bytes32 r;
        bytes32 s;
        uint8 v;
        assembly ("memory-safe") {
            r := mload(add(signature, 0x20))
            s := mload(add(signature, 0x40))
            v := byte(0, mload(add(signature, 0x60)))
        }
        if (v < 27) {
            v += 27; // accept the 0/1 recovery-id form too
        }
        require(v == 27 || v == 28, "TestToken: invalid signature 'v' value");
        require(uint256(s) <= HALF_CURVE_ORDER, "TestToken: invalid signature 's' value");
        address recovered = ecrecover(digest, v, r, s);
        require(recovered != address(0) && recovered == signer, "TestToken: invalid signature");
    }
}
