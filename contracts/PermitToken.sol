// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

/// @title PermitToken — an ERC-20 with EIP-2612 `permit` and without EIP-3009, for local tests of
///        Permit2 gas sponsoring.
/// @notice 6 decimals, EIP-712 domain {name: "Permit Dollar", version: "1"}, `permit`, `nonces`,
///         `DOMAIN_SEPARATOR`, EIP-5267 `eip712Domain`; no `authorizationState` (a call to it
///         reverts), so it can only be paid via Permit2, and a payer without a Permit2 allowance
///         can grant one by signature. `mint` is open to anyone: this contract is for test chains only.
/// @dev Written for this project.
contract PermitToken {
    string public constant name = "Permit Dollar";
    string public constant symbol = "PRMT";
    uint8 public constant decimals = 6;
    /// @notice EIP-712 domain version.
    string public constant version = "1";

    uint256 public totalSupply;
    mapping(address => uint256) public balanceOf;
    mapping(address => mapping(address => uint256)) public allowance;
    /// @notice EIP-2612: the next permit nonce of each owner.
    mapping(address => uint256) public nonces;

    bytes32 private constant DOMAIN_TYPEHASH =
        keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)");
    bytes32 public constant PERMIT_TYPEHASH =
        keccak256("Permit(address owner,address spender,uint256 value,uint256 nonce,uint256 deadline)");
    /// @dev Upper bound for `s` (secp256k1 order / 2): higher values are malleable copies.
    uint256 private constant HALF_CURVE_ORDER = 0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0;

    event Transfer(address indexed from, address indexed to, uint256 value);
    event Approval(address indexed owner, address indexed spender, uint256 value);

    function transfer(address to, uint256 value) external returns (bool) {
        moveTokens(msg.sender, to, value);
        return true;
    }

    function approve(address spender, uint256 value) external returns (bool) {
        setAllowance(msg.sender, spender, value);
        return true;
    }

    function transferFrom(address from, address to, uint256 value) external returns (bool) {
        uint256 allowed = allowance[from][msg.sender];
        if (allowed != type(uint256).max) {
            require(allowed >= value, "PermitToken: transfer amount exceeds allowance");
            unchecked {
                allowance[from][msg.sender] = allowed - value;
            }
        }
        moveTokens(from, to, value);
        return true;
    }

    /// @notice EIP-2612: sets `spender`'s allowance over `owner`'s tokens by `owner`'s signature.
    function permit(address owner, address spender, uint256 value, uint256 deadline, uint8 v, bytes32 r, bytes32 s)
        external
    {
        require(block.timestamp <= deadline, "PermitToken: permit expired");
        require(owner != address(0), "PermitToken: owner is the zero address");
        require(uint256(s) <= HALF_CURVE_ORDER, "PermitToken: invalid signature 's' value");
        uint256 nonce = nonces[owner];
        bytes32 structHash = keccak256(abi.encode(PERMIT_TYPEHASH, owner, spender, value, nonce, deadline));
        bytes32 digest = keccak256(abi.encodePacked(hex"1901", DOMAIN_SEPARATOR(), structHash));
        address signer = ecrecover(digest, v, r, s);
        require(signer != address(0) && signer == owner, "PermitToken: invalid signature");
        unchecked {
            nonces[owner] = nonce + 1;
        }
        setAllowance(owner, spender, value);
    }

    function DOMAIN_SEPARATOR() public view returns (bytes32) {
        return keccak256(
            abi.encode(DOMAIN_TYPEHASH, keccak256(bytes(name)), keccak256(bytes(version)), block.chainid, address(this))
        );
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

    /// @notice Open mint for tests: anyone may create tokens for anyone.
    function mint(address to, uint256 value) external returns (bool) {
        require(to != address(0), "PermitToken: mint to the zero address");
        totalSupply += value;
        unchecked {
            balanceOf[to] += value; // cannot overflow: bounded by totalSupply
        }
        emit Transfer(address(0), to, value);
        return true;
    }

    function setAllowance(address owner, address spender, uint256 value) private {
        allowance[owner][spender] = value;
        emit Approval(owner, spender, value);
    }

    function moveTokens(address from, address to, uint256 value) private {
        require(to != address(0), "PermitToken: transfer to the zero address");
        uint256 held = balanceOf[from];
        require(held >= value, "PermitToken: transfer amount exceeds balance");
        unchecked {
            balanceOf[from] = held - value;
            balanceOf[to] += value;
        }
        emit Transfer(from, to, value);
    }
}
