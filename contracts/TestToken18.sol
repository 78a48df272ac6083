// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

import {TestToken} from "./TestToken.sol";

/// @title TestToken18 — TestToken with 18 decimals, for local tests only.
/// @notice A stablecoin of another unit than USDC's: the same EIP-3009 authorizations and
///         EIP-712 domain fields, atomic units 10^12 times smaller. Lets the tests share one
///         budget between assets of different decimals (a budget currency).
/// @dev Written for this project.
contract TestToken18 is TestToken {
    function decimals() public pure override returns (uint8) {
        return 18;
    }
}
