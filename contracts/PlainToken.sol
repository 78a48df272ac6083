// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

/// @title PlainToken — an ERC-20 without EIP-3009, for local Permit2 tests.
/// @notice 6 decimals, no `authorizationState` (a call to it reverts), so it can only be paid
///         via Permit2. `mint` is open to anyone: this contract is for test chains only.
/// @dev Written for this project.
contract PlainToken {
    string public constant name = "Plain Dollar";
    string public constant symbol = "PLAIN";
    uint8 public constant decimals = 6;

    uint256 public totalSupply;
    mapping(address => uint256) public balanceOf;
    mapping(address => mapping(address => uint256)) public allowance;

    event Transfer(address indexed from, address indexed to, uint256 value);
    event Approval(address indexed owner, address indexed spender, uint256 value);

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
            require(allowed >= value, "PlainToken: transfer amount exceeds allowance");
            unchecked {
                allowance[from][msg.sender] = allowed - value;
            }
        }
        moveTokens(from, to, value);
        return true;
    }

    /// @notice Open mint for tests: anyone may create tokens for anyone.
    function mint(address to, uint256 value) external returns (bool) {
        require(to != address(0), "PlainToken: mint to the zero address");
        totalSupply += value;
        unchecked {
            balanceOf[to] += value; // cannot overflow: bounded by totalSupply
        }
        emit Transfer(address(0), to, value);
        return true;
    }

    function moveTokens(address from, address to, uint256 value) private {
        require(to != address(0), "PlainToken: transfer to the zero address");
        uint256 held = balanceOf[from];
        require(held >= value, "PlainToken: transfer amount exceeds balance");
        unchecked {
            balanceOf[from] = held - value;
            balanceOf[to] += value;
        }
        emit Transfer(from, to, value);
    }
}
